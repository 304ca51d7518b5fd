//! gRPC over h2c through weir: status codes from trailers-only responses and
//! from trailers, grpc-timeout rewriting, gRPC-shaped errors; and a real
//! third-party HTTP/2 client (h2load) against weir.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::{Request, Response};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

type Chunk = Result<Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>;

/// A gRPC-style response: a 5-byte-framed message, then trailers.
fn grpc_reply(status: u8) -> Response<TestBody> {
    let frames: Vec<Chunk> = vec![
        Ok(Frame::data(Bytes::from_static(b"\x00\x00\x00\x00\x02hi"))),
        Ok(Frame::trailers({
            let mut t = http::HeaderMap::new();
            t.insert("grpc-status", status.to_string().parse().unwrap());
            t
        })),
    ];
    Response::builder()
        .header("content-type", "application/grpc")
        .body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
            frames,
        ))))
        .unwrap()
}

/// A trailers-only response: the status in the headers, no body.
fn trailers_only(status: u8) -> Response<TestBody> {
    Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", status.to_string())
        .body(body(""))
        .unwrap()
}

fn grpc_request(path: &str, timeout: Option<&str>) -> Request<TestBody> {
    // gRPC calls are POSTs: a call is replayable when the client marks it
    // idempotent with the idempotency-key metadata (docs/reference/retries.md#classifying-an-attempt).
    let mut b = Request::post(format!("http://svc{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("idempotency-key", "call-1");
    if let Some(t) = timeout {
        b = b.header("grpc-timeout", t);
    }
    b.body(body(Bytes::from_static(b"\x00\x00\x00\x00\x00")))
        .unwrap()
}

/// (headers' grpc-status, trailers' grpc-status, x-weir-attempts, x-weir-error)
async fn call(
    weir: &Weir,
    req: Request<TestBody>,
) -> (Option<String>, Option<String>, String, String) {
    let resp = h2_request(weir.addr, req).await;
    assert_eq!(resp.status(), 200, "gRPC answers are HTTP 200");
    let (parts, b) = resp.into_parts();
    let collected = b.collect().await.unwrap();
    let trailers = collected.trailers().cloned();
    (
        parts
            .headers
            .get("grpc-status")
            .map(|v| v.to_str().unwrap().to_string()),
        trailers.and_then(|t| {
            t.get("grpc-status")
                .map(|v| v.to_str().unwrap().to_string())
        }),
        header_of(&parts, "x-weir-attempts"),
        header_of(&parts, "x-weir-error"),
    )
}

fn header_of(parts: &http::response::Parts, name: &str) -> String {
    parts
        .headers
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// Answers `first` for the first request, OK after that.
async fn first_then_ok(first: fn(u8) -> Response<TestBody>, code: u8) -> TestUpstream {
    let n = Arc::new(AtomicUsize::new(0));
    TestUpstream::start(move |_r| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        async move {
            if i == 0 {
                first(code)
            } else {
                grpc_reply(0)
            }
        }
    })
    .await
}

const GRPC: &str = "protocol = \"grpc\"\n[upstreams.svc.retry]\nretry_on = [\"unavailable\", \"connect-failure\"]\n[upstreams.svc.retry.backoff]\nbase = \"5ms\"\n";

#[tokio::test]
async fn unavailable_trailers_only_is_retried() {
    let up = first_then_ok(trailers_only, 14).await;
    let weir = Weir::single(&up.url(), GRPC).await;
    let (_, trailer, attempts, _) = call(&weir, grpc_request("/pkg.Svc/Get", None)).await;
    assert_eq!(trailer.as_deref(), Some("0"));
    assert_eq!(attempts, "2");
    assert_eq!(up.requests(), 2);
}

/// A status in trailers after a message is not retried: the response is
/// held only until its first message, then streams (a server stream must
/// not wait for its trailers), so the call has started by then.
#[tokio::test]
async fn unavailable_in_trailers_after_a_message_is_passed_on() {
    let up = first_then_ok(grpc_reply, 14).await;
    let weir = Weir::single(&up.url(), GRPC).await;
    let (_, trailer, attempts, _) = call(&weir, grpc_request("/pkg.Svc/Get", None)).await;
    assert_eq!(trailer.as_deref(), Some("14"));
    assert_eq!(attempts, "1");
    assert_eq!(up.requests(), 1);
}

#[tokio::test]
async fn an_unmarked_call_is_not_replayed() {
    let up = first_then_ok(trailers_only, 14).await;
    let weir = Weir::single(&up.url(), GRPC).await;
    let mut req = grpc_request("/pkg.Svc/Charge", None);
    req.headers_mut().remove("idempotency-key");
    let resp = h2_request(weir.addr, req).await;
    assert_eq!(resp.headers()["grpc-status"], "14");
    assert_eq!(resp.headers()["x-weir-retry-stop"], "unsafe");
    assert_eq!(up.requests(), 1);
}

#[tokio::test]
async fn ok_is_not_retried_and_other_codes_pass_through() {
    let up = TestUpstream::start(|_r| async move { grpc_reply(0) }).await;
    let weir = Weir::single(&up.url(), GRPC).await;
    let (_, trailer, attempts, _) = call(&weir, grpc_request("/pkg.Svc/Get", None)).await;
    assert_eq!((trailer.as_deref(), attempts.as_str()), (Some("0"), "1"));
    assert_eq!(up.requests(), 1);

    // NOT_FOUND is not in retry_on: returned as it came.
    let up = TestUpstream::start(|_r| async move { grpc_reply(5) }).await;
    let weir = Weir::single(&up.url(), GRPC).await;
    let (_, trailer, attempts, _) = call(&weir, grpc_request("/pkg.Svc/Get", None)).await;
    assert_eq!((trailer.as_deref(), attempts.as_str()), (Some("5"), "1"));
}

#[tokio::test]
async fn grpc_timeout_is_rewritten_to_the_time_left() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        let t = req
            .headers()
            .get("grpc-timeout")
            .map(|v| v.to_str().unwrap().to_string());
        s.lock().unwrap().push(t);
        async move { grpc_reply(0) }
    })
    .await;
    let weir = Weir::single(&up.url(), GRPC).await;
    call(&weir, grpc_request("/pkg.Svc/Get", Some("1S"))).await;
    let t = seen.lock().unwrap()[0].clone().unwrap();
    let ms: u64 = t.trim_end_matches('m').parse().unwrap();
    assert!(
        t.ends_with('m') && ms <= 1000 && ms > 500,
        "grpc-timeout forwarded as {t}"
    );
}

#[tokio::test]
async fn weir_errors_reach_grpc_clients_as_grpc_statuses() {
    let up =
        TestUpstream::start(
            |_r| async move { Response::builder().status(503).body(body("")).unwrap() },
        )
        .await;
    let weir = Weir::single(
        &up.url(),
        "protocol = \"grpc\"\n[upstreams.svc.retry]\nmax_attempts = 1\n[upstreams.svc.breaker]\nconsecutive_failures = 1\nfailing_for = \"0s\"\n",
    )
    .await;
    // The 503 opens the breaker; the next call is refused by weir itself.
    let resp = h2_request(weir.addr, grpc_request("/pkg.Svc/Get", None)).await;
    assert_eq!(resp.status(), 503);
    let (status, _, _, error) = call(&weir, grpc_request("/pkg.Svc/Get", None)).await;
    assert_eq!(
        (status.as_deref(), error.as_str()),
        (Some("14"), "circuit_open")
    );
    assert_eq!(up.requests(), 1);

    // No route: UNIMPLEMENTED.
    let req = Request::post("http://nowhere/pkg.Svc/Get")
        .header("content-type", "application/grpc")
        .body(body(""))
        .unwrap();
    let (status, _, _, error) = call(&weir, req).await;
    assert_eq!(
        (status.as_deref(), error.as_str()),
        (Some("12"), "no_route")
    );
}

/// Regression (issue 54, item 8): 70 KB of metadata reached a gRPC client
/// as a bare HTTP 431 from the HTTP/2 layer (grpcio: `UNKNOWN 'Received
/// http2 header with status: 431'`). weir reads a header list up to twice
/// `max_header_bytes` itself and refuses what is over the limit the way it
/// refuses the rest: gRPC-shaped for gRPC (`RESOURCE_EXHAUSTED`, as gRPC's
/// own metadata limit answers), its JSON 431 otherwise.
#[tokio::test]
async fn oversized_metadata_gets_resource_exhausted() {
    let up = TestUpstream::start(|_r| async move { grpc_reply(0) }).await;
    let weir = Weir::single(&up.url(), GRPC).await;
    let big = |kib: usize| http::HeaderValue::from_str(&"m".repeat(kib * 1024)).unwrap();
    let mut req = grpc_request("/pkg.Svc/Get", None);
    req.headers_mut().insert("x-metadata", big(70));
    let resp = h2_request(weir.addr, req).await;
    assert_eq!(resp.status(), 200, "a gRPC error is an HTTP 200");
    let h = resp.headers();
    assert_eq!(h["content-type"], "application/grpc");
    assert_eq!(h["grpc-status"], "8", "RESOURCE_EXHAUSTED");
    assert_eq!(h["x-weir-error"], "header_too_large");
    let message = h["grpc-message"].to_str().unwrap();
    assert!(message.starts_with("weir header_too_large"), "{message}");
    assert_eq!(up.requests(), 0);

    // Not gRPC: weir's JSON 431.
    let req = Request::get("http://svc/x")
        .header("x-metadata", big(70))
        .body(body(""))
        .unwrap();
    let (status, code, json) = json_error(h2_request(weir.addr, req).await).await;
    assert_eq!((status, code.as_str()), (431, "header_too_large"));
    assert_eq!(json["error"], "header_too_large");

    // Within the limit, a call goes through (to an upstream whose HTTP/2
    // limit, hyper's 16 KiB, takes it)…
    let mut req = grpc_request("/pkg.Svc/Get", None);
    req.headers_mut().insert("x-metadata", big(12));
    let (_, trailer, attempts, _) = call(&weir, req).await;
    assert_eq!((trailer.as_deref(), attempts.as_str()), (Some("0"), "1"));
    assert_eq!(up.requests(), 1);
    // …and so does an HTTP/2 head just under the limit (64 KiB by default).
    let up = TestUpstream::text("ok").await;
    let weir = Weir::single(&up.url(), "").await;
    let req = Request::get("http://svc/x")
        .header("x-metadata", big(63))
        .body(body(""))
        .unwrap();
    assert_eq!(h2_request(weir.addr, req).await.status(), 200);
    assert_eq!(up.requests(), 1);
}

/// Interoperability beyond hyper talking to hyper: nghttp2's h2load drives
/// weir over HTTP/2 prior knowledge. `.ci/run` installs it and sets
/// WEIR_REQUIRE_H2LOAD=1; elsewhere the test says it was skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2load_drives_weir_over_h2c() {
    if std::process::Command::new("h2load")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("WEIR_REQUIRE_H2LOAD").is_none(),
            "h2load is required here (apt-get install nghttp2-client)"
        );
        eprintln!("SKIPPED: h2load not installed (apt-get install nghttp2-client)");
        return;
    }
    let up = TestUpstream::text("ok").await;
    let weir = Weir::start(&format!(
        "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"127.0.0.1\"]\n",
        up.url()
    ))
    .await;
    let url = format!("http://127.0.0.1:{}/", weir.addr.port());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("h2load")
            .args(["-n", "400", "-c", "4", "-m", "8", &url])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("400 succeeded"), "{text}");
    assert!(text.contains("status codes: 400 2xx"), "{text}");
    assert_eq!(up.requests(), 400);
}

/// Regression: a response that ends with trailers was counted as one the
/// client abandoned (hyper's HTTP/2 server sends the trailers and never asks
/// the body again), so a gRPC client making more than
/// `max_resets_per_second` calls a second on one connection had it closed
/// under it.
#[tokio::test]
async fn calls_ending_in_trailers_are_not_counted_as_abandoned() {
    let up = TestUpstream::start(|_r| async { grpc_reply(0) }).await;
    let weir = Weir::with_server(
        "max_resets_per_second = 5",
        &format!(
            "[upstreams.svc]\nurl = \"{}\"\nhosts = [\"svc\"]\n{GRPC}",
            up.url()
        ),
    )
    .await;
    // One connection for every call: weir must not close it under them.
    let (mut send, conn) = h2_connect(weir.addr).await;
    for i in 0..40 {
        // A key per call: a repeated key would be answered from its record.
        let mut req = grpc_request("/pkg.Svc/Unary", None);
        let key = format!("call-{i}").parse().unwrap();
        req.headers_mut().insert("idempotency-key", key);
        let resp = send
            .send_request(req)
            .await
            .unwrap_or_else(|e| panic!("call {i}: {e}"));
        let (_, b) = resp.into_parts();
        let trailers = b.collect().await.unwrap().trailers().cloned().unwrap();
        assert_eq!(trailers["grpc-status"], "0", "call {i}");
    }
    assert!(!conn.is_finished(), "weir closed the connection");
    assert_eq!(up.requests(), 40);
}

/// A gRPC request as real clients send it over HTTP/2: no content-length,
/// the message in a data frame, then the end of the stream.
fn streamed_grpc_request(path: &str) -> Request<TestBody> {
    let frames: Vec<Chunk> = vec![Ok(Frame::data(Bytes::from_static(b"\x00\x00\x00\x00\x00")))];
    Request::post(format!("http://svc{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("idempotency-key", "call-2")
        .body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
            frames,
        ))))
        .unwrap()
}

/// Regression (gap review): a unary call without content-length was streamed,
/// so its UNAVAILABLE could never be retried.
#[tokio::test]
async fn a_unary_call_without_content_length_is_retried_over_one_h2_connection() {
    let versions = Arc::new(Mutex::new(Vec::new()));
    let n = Arc::new(AtomicUsize::new(0));
    let (v, n2) = (versions.clone(), n.clone());
    let up = TestUpstream::start(move |req: Request<hyper::body::Incoming>| {
        v.lock().unwrap().push(req.version());
        let i = n2.fetch_add(1, Ordering::SeqCst);
        async move {
            if i == 0 {
                trailers_only(14)
            } else {
                grpc_reply(0)
            }
        }
    })
    .await;
    let weir = Weir::single(&up.url(), GRPC).await;
    let (_, trailer, attempts, _) = call(&weir, streamed_grpc_request("/pkg.Svc/Get")).await;
    assert_eq!((trailer.as_deref(), attempts.as_str()), (Some("0"), "2"));
    // Concurrent calls share the one HTTP/2 connection.
    let mut calls = Vec::new();
    for _ in 0..8 {
        let addr = weir.addr;
        calls.push(tokio::spawn(async move {
            h2_request(addr, streamed_grpc_request("/pkg.Svc/Get"))
                .await
                .status()
        }));
    }
    for c in calls {
        assert_eq!(c.await.unwrap(), 200);
    }
    assert!(versions
        .lock()
        .unwrap()
        .iter()
        .all(|v| *v == http::Version::HTTP_2));
    assert_eq!(
        up.connections(),
        1,
        "h2c calls should be multiplexed on one connection"
    );
}

/// A streaming call that pauses is forwarded as it comes: the upstream answers
/// before the client has finished sending.
#[tokio::test]
async fn a_streaming_call_is_not_held_back() {
    let up = TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        // Answer as soon as the first message arrives, without waiting for the end.
        let mut body = req.into_body();
        let _ = body.frame().await;
        tokio::spawn(async move { while body.frame().await.is_some() {} });
        grpc_reply(0)
    })
    .await;
    let weir = Weir::single(&up.url(), GRPC).await;
    let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(4);
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    let req = Request::post("http://svc/pkg.Svc/Chat")
        .header("content-type", "application/grpc")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .unwrap();
    tx.send(Ok(Frame::data(Bytes::from_static(b"\x00\x00\x00\x00\x00"))))
        .await
        .unwrap();
    let resp = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        h2_request(weir.addr, req),
    )
    .await
    .expect("the response waited for the client's stream to end");
    assert_eq!(resp.status(), 200);
    drop(tx);
}

#[tokio::test]
async fn a_deadline_reaches_a_grpc_client_as_deadline_exceeded() {
    let up = TestUpstream::start(|_r| async move {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        grpc_reply(0)
    })
    .await;
    let weir = Weir::single(&up.url(), GRPC).await;
    let (status, _, _, error) = call(&weir, grpc_request("/pkg.Svc/Get", Some("100m"))).await;
    assert_eq!(
        (status.as_deref(), error.as_str()),
        (Some("4"), "deadline_exceeded")
    );
}

// ---- gRPC policies: the status is the outcome ----
// (docs/guide/tls-and-grpc.md#grpc-policies)

/// weir's metrics as `/metrics` shows them.
fn metrics(weir: &Weir) -> String {
    weir.handle.as_ref().unwrap().snapshot().metrics.render()
}

/// A gRPC answer with a message, then trailers with `status` and `x-a: 1`.
fn reply_with_trailing(status: u8) -> Response<TestBody> {
    let frames: Vec<Chunk> = vec![
        Ok(Frame::data(Bytes::from_static(b"\x00\x00\x00\x00\x02ok"))),
        Ok(Frame::trailers({
            let mut t = http::HeaderMap::new();
            t.insert("grpc-status", status.to_string().parse().unwrap());
            t.insert("x-a", "1".parse().unwrap());
            t
        })),
    ];
    Response::builder()
        .header("content-type", "application/grpc")
        .body(BodyExt::boxed(StreamBody::new(futures_util::stream::iter(
            frames,
        ))))
        .unwrap()
}

/// Answers trailers-only `code` to the first `n` requests, OK after.
async fn failing_first(n: usize, code: u8) -> TestUpstream {
    let seen = Arc::new(AtomicUsize::new(0));
    TestUpstream::start(move |_r| {
        let i = seen.fetch_add(1, Ordering::SeqCst);
        async move {
            if i < n {
                trailers_only(code)
            } else {
                reply_with_trailing(0)
            }
        }
    })
    .await
}

/// A keyed call that every attempt answered UNAVAILABLE was not processed:
/// no record keeps it, and its repeat reaches the (healthy again) server.
/// (Before: the repeat got the UNAVAILABLE from the record, for a day.)
#[tokio::test]
async fn a_keyed_call_that_failed_is_forwarded_again() {
    for code in [14u8, 8] {
        let up = failing_first(1, code).await;
        let weir = Weir::single(&up.url(), "protocol = \"grpc\"\n").await;
        let (head, _, attempts, _) = call(&weir, grpc_request("/pkg.Svc/Pay", None)).await;
        assert_eq!(
            (head.as_deref(), attempts.as_str()),
            (Some(code.to_string().as_str()), "1")
        );
        let resp = h2_request(weir.addr, grpc_request("/pkg.Svc/Pay", None)).await;
        assert!(
            resp.headers().get("idempotent-replayed").is_none(),
            "code {code}"
        );
        let (_, b) = resp.into_parts();
        let t = b.collect().await.unwrap().trailers().cloned().unwrap();
        assert_eq!(t["grpc-status"], "0", "code {code}");
        assert_eq!(
            up.requests(),
            2,
            "code {code}: the repeat reached the server"
        );
    }
}

/// A keyed call that succeeded, its status in trailers after its message,
/// is kept whole and its repeat replayed whole: head, message, trailers.
/// (Before: it was not kept, and its repeat got ALREADY_EXISTS.)
#[tokio::test]
async fn a_keyed_call_that_succeeded_is_replayed_whole() {
    let up = TestUpstream::start(|_r| async move { reply_with_trailing(0) }).await;
    let weir = Weir::single(&up.url(), "protocol = \"grpc\"\n").await;
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let resp = h2_request(weir.addr, grpc_request("/pkg.Svc/Pay", None)).await;
        let (parts, b) = resp.into_parts();
        let collected = b.collect().await.unwrap();
        let t = collected.trailers().cloned().expect("trailers");
        assert_eq!(t["grpc-status"], "0");
        assert_eq!(t["x-a"], "1");
        bodies.push((
            header_of(&parts, "idempotent-replayed"),
            collected.to_bytes(),
        ));
    }
    assert_eq!(bodies[0].0, "");
    assert_eq!(bodies[1].0, "true");
    assert_eq!(bodies[0].1, bodies[1].1);
    assert_eq!(&bodies[1].1[..], b"\x00\x00\x00\x00\x02ok");
    assert_eq!(up.requests(), 1);
}

const DECLARED: &str = "protocol = \"grpc\"\n[upstreams.svc.retry]\nretry_on = [\"unavailable\"]\n[upstreams.svc.retry.backoff]\nbase = \"5ms\"\n[upstreams.svc.grpc]\nidempotent_methods = [\"/pkg.Reads/*\", \"/pkg.Svc/Get\"]\n";

/// A method the upstream declares safe to retry is retried on a listed
/// code without a key; any other is not. (Before: no way to declare one.)
#[tokio::test]
async fn a_declared_method_is_retried_without_a_key() {
    for (path, retried) in [
        ("/pkg.Reads/List", true),
        ("/pkg.Svc/Get", true),
        ("/pkg.Svc/Charge", false),
    ] {
        let up = failing_first(1, 14).await;
        let weir = Weir::single(&up.url(), DECLARED).await;
        let mut req = grpc_request(path, None);
        req.headers_mut().remove("idempotency-key");
        let resp = h2_request(weir.addr, req).await;
        let (parts, b) = resp.into_parts();
        let _ = b.collect().await.unwrap();
        let attempts = header_of(&parts, "x-weir-attempts");
        assert_eq!(attempts, if retried { "2" } else { "1" }, "{path}");
        if !retried {
            assert_eq!(header_of(&parts, "x-weir-retry-stop"), "unsafe");
        }
    }
}

/// UNAVAILABLE counts for the breaker as a 503 does, whether it comes in a
/// trailers-only answer or in trailers after a message. (Before: 20 in a
/// row left it closed.)
#[tokio::test]
async fn the_breaker_opens_on_unavailable() {
    for in_trailers in [false, true] {
        let up = TestUpstream::start(move |_r| async move {
            if in_trailers {
                reply_with_trailing(14)
            } else {
                trailers_only(14)
            }
        })
        .await;
        let cfg = "protocol = \"grpc\"\n[upstreams.svc.breaker]\nconsecutive_failures = 5\nfailing_for = \"0s\"\nopen = \"10s\"\nmax_open = \"10s\"\n";
        let weir = Weir::single(&up.url(), cfg).await;
        let mut errors = Vec::new();
        for i in 0..8 {
            let req = grpc_request(&format!("/pkg.Svc/Get{i}"), None);
            let resp = h2_request(weir.addr, req).await;
            let (parts, b) = resp.into_parts();
            let _ = b.collect().await.unwrap();
            errors.push(header_of(&parts, "x-weir-error"));
        }
        assert_eq!(up.requests(), 5, "trailers: {in_trailers}: {errors:?}");
        assert_eq!(errors[5], "circuit_open", "trailers: {in_trailers}");
        let m = metrics(&weir);
        assert!(
            m.contains(r#"weir_requests_total{code="200",error="circuit_open",grpc_code="Unavailable",upstream="svc"} 3"#),
            "{m}"
        );
        assert!(
            m.contains(r#"weir_requests_total{code="200",error="",grpc_code="Unavailable",upstream="svc"} 5"#),
            "{m}"
        );
        assert!(
            m.contains(r#"weir_upstream_attempts_total{grpc_code="Unavailable",result="ok",upstream="svc"} 5"#),
            "{m}"
        );
    }
}

/// The metrics name the code each call ended with, from a trailers-only
/// head or the trailers, and weir's own errors as the client got them.
/// (Before: every call was `code="200"`, weir's errors 502/504.)
#[tokio::test]
async fn metrics_carry_grpc_code() {
    let up = TestUpstream::start(|r: Request<hyper::body::Incoming>| async move {
        match r.uri().path() {
            "/pkg.Svc/Ok" => reply_with_trailing(0),
            "/pkg.Svc/Missing" => reply_with_trailing(5),
            _ => trailers_only(14),
        }
    })
    .await;
    let weir = Weir::single(&up.url(), "protocol = \"grpc\"\n").await;
    for path in ["/pkg.Svc/Ok", "/pkg.Svc/Missing", "/pkg.Svc/Down"] {
        let mut req = grpc_request(path, None);
        req.headers_mut().remove("idempotency-key");
        let _ = call(&weir, req).await;
    }
    let refused = refused_addr().await;
    let down = Weir::single(&format!("http://{refused}"), "protocol = \"grpc\"\n").await;
    let mut req = grpc_request("/pkg.Svc/Ok", None);
    req.headers_mut().remove("idempotency-key");
    let (head, _, _, error) = call(&down, req).await;
    assert_eq!(
        (head.as_deref(), error.as_str()),
        (Some("14"), "connect_failed")
    );
    let m = metrics(&weir);
    for code in ["OK", "NotFound", "Unavailable"] {
        let line = format!(
            r#"weir_requests_total{{code="200",error="",grpc_code="{code}",upstream="svc"}} 1"#
        );
        assert!(m.contains(&line), "{line}\n{m}");
    }
    assert!(
        !m.contains(r#"weir_requests_total{code="200",error="",upstream="svc"}"#),
        "{m}"
    );
    let m = metrics(&down);
    assert!(
        m.contains(r#"weir_requests_total{code="200",error="connect_failed",grpc_code="Unavailable",upstream="svc"} 1"#),
        "{m}"
    );
}

/// A declared method is hedged without a key (and without
/// `keyed_writes`): the first attempt stalls, the hedge answers. An
/// undeclared one is not hedged. (Before: a gRPC call was hedged only with
/// a key and `keyed_writes = true`.)
#[tokio::test]
async fn a_declared_method_is_hedged_without_a_key() {
    for (path, hedged) in [("/pkg.Reads/List", true), ("/pkg.Svc/Charge", false)] {
        let seen = Arc::new(AtomicUsize::new(0));
        let up = TestUpstream::start(move |_r| {
            let i = seen.fetch_add(1, Ordering::SeqCst);
            async move {
                if i == 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
                }
                reply_with_trailing(0)
            }
        })
        .await;
        let cfg = format!("{DECLARED}[upstreams.svc.hedge]\nafter = \"20ms\"\nmax_extra = 1.0\n");
        let weir = Weir::single(&up.url(), &cfg).await;
        let mut req = grpc_request(path, None);
        req.headers_mut().remove("idempotency-key");
        let resp = h2_request(weir.addr, req).await;
        let (parts, b) = resp.into_parts();
        let t = b.collect().await.unwrap().trailers().cloned().unwrap();
        assert_eq!(t["grpc-status"], "0");
        let hedge = header_of(&parts, "x-weir-hedge");
        assert_eq!(hedge, if hedged { "won" } else { "" }, "{path}");
        assert_eq!(up.requests(), if hedged { 2 } else { 1 }, "{path}");
    }
}

/// An endpoint whose calls end UNAVAILABLE in their trailers, after a
/// message, is ejected as one that answers 503 is: its status is judged
/// when the trailers come. (Before: such an answer was a success for the
/// endpoint, which kept half the calls.)
#[tokio::test]
async fn an_endpoint_failing_in_its_trailers_is_ejected() {
    let bad =
        TestUpstream::start_at("127.0.0.2:0", |_r| async move { reply_with_trailing(14) }).await;
    let good =
        TestUpstream::start_at("127.0.0.3:0", |_r| async move { reply_with_trailing(0) }).await;
    let addr = |u: &TestUpstream| u.url().trim_start_matches("http://").to_string();
    let cfg = format!(
        "[upstreams.svc]\nurl = \"http://svc.internal\"\nhosts = [\"svc\"]\nprotocol = \"grpc\"\n\
         endpoints = [\"{}\", \"{}\"]\nbalance = \"round_robin\"\n\
         [upstreams.svc.ejection]\nconsecutive_failures = 3\nbase = \"30s\"\n\
         [upstreams.svc.breaker]\nenabled = false\n",
        addr(&bad),
        addr(&good)
    );
    let weir = Weir::start(&cfg).await;
    for i in 0..40 {
        let mut req = grpc_request(&format!("/pkg.Svc/M{i}"), None);
        req.headers_mut().remove("idempotency-key");
        let resp = h2_request(weir.addr, req).await;
        let _ = resp.into_body().collect().await.unwrap();
    }
    assert!(
        bad.requests() <= 4,
        "the failing endpoint got {} of 40",
        bad.requests()
    );
    assert_eq!(bad.requests() + good.requests(), 40);
}
