//! Pushback (docs/reference/retries.md#pushback): an answer that asks not
//! to be retried, or to be retried later, is taken at its word — gRPC's
//! `grpc-retry-pushback-ms` (gRFC A6), Envoy's `x-envoy-overloaded`, and
//! another weir's refusal under load — and weir's own refusals say so in
//! the way the next proxy reads. Issue 54, items 6 and 7.
#![allow(clippy::unwrap_used)]

use crate::common;

use bytes::Bytes;
use common::*;
use http_body_util::BodyExt;
use hyper::{Request, Response};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

const GRPC: &str = "protocol = \"grpc\"\n[upstreams.svc.retry]\nretry_on = [\"unavailable\", \"connect-failure\"]\n[upstreams.svc.retry.backoff]\nbase = \"5ms\"\njitter = \"none\"\n";

/// An upstream that answers its first call with `first` and OK after that,
/// and keeps when each call came (on the test's clock, paused or not).
struct Calls {
    up: TestUpstream,
    at: Arc<Mutex<Vec<Instant>>>,
}

impl Calls {
    async fn start(first: fn() -> Response<TestBody>) -> Calls {
        let at = Arc::new(Mutex::new(Vec::new()));
        let seen = at.clone();
        let up = TestUpstream::start(move |_r| {
            let n = {
                let mut v = seen.lock().unwrap();
                v.push(Instant::now());
                v.len()
            };
            async move {
                if n == 1 {
                    first()
                } else {
                    grpc_ok()
                }
            }
        })
        .await;
        Calls { up, at }
    }

    fn count(&self) -> usize {
        self.up.requests()
    }

    /// The wait between the first call and the second.
    fn gap(&self) -> Duration {
        let at = self.at.lock().unwrap();
        at[1] - at[0]
    }
}

fn grpc_ok() -> Response<TestBody> {
    Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", "0")
        .body(body(""))
        .unwrap()
}

/// A trailers-only UNAVAILABLE with `grpc-retry-pushback-ms: value`.
fn unavailable_with_pushback(value: &'static str) -> Response<TestBody> {
    Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", "14")
        .header("grpc-retry-pushback-ms", value)
        .body(body(""))
        .unwrap()
}

/// A keyed unary call: retryable when its outcome is listed.
fn grpc_call() -> Request<TestBody> {
    Request::post("http://svc/pkg.Svc/Get")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("idempotency-key", "call-1")
        .body(body(Bytes::from_static(b"\x00\x00\x00\x00\x00")))
        .unwrap()
}

/// (grpc-status from the head or the trailers, x-weir-attempts, x-weir-retry-stop)
async fn call(weir: &Weir) -> (String, String, String) {
    let resp = h2_request(weir.addr, grpc_call()).await;
    assert_eq!(resp.status(), 200);
    let (parts, b) = resp.into_parts();
    let trailers = b.collect().await.unwrap().trailers().cloned();
    let status = parts
        .headers
        .get("grpc-status")
        .or(trailers.as_ref().and_then(|t| t.get("grpc-status")))
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (
        status,
        header(&parts, "x-weir-attempts"),
        header(&parts, "x-weir-retry-stop"),
    )
}

/// Regression (issue 54): `grpc-retry-pushback-ms: -1` was retried.
#[tokio::test(start_paused = true)]
async fn a_negative_grpc_pushback_is_not_retried() {
    let up = Calls::start(|| unavailable_with_pushback("-1")).await;
    let weir = Weir::single(&up.up.url(), GRPC).await;
    let (status, attempts, stop) = call(&weir).await;
    assert_eq!(
        (status.as_str(), attempts.as_str(), stop.as_str()),
        ("14", "1", "pushback")
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(up.count(), 1);
}

/// A value gRPC cannot read means "do not retry" too (gRFC A6).
#[tokio::test(start_paused = true)]
async fn a_malformed_grpc_pushback_is_not_retried() {
    let up = Calls::start(|| unavailable_with_pushback("soon")).await;
    let weir = Weir::single(&up.up.url(), GRPC).await;
    let (status, attempts, stop) = call(&weir).await;
    assert_eq!(
        (status.as_str(), attempts.as_str(), stop.as_str()),
        ("14", "1", "pushback")
    );
    assert_eq!(up.count(), 1);
}

/// Regression (issue 54): `grpc-retry-pushback-ms: 2000` was retried
/// after the backoff's few milliseconds. The asked wait replaces it.
#[tokio::test(start_paused = true)]
async fn a_grpc_pushback_sets_the_wait_before_the_retry() {
    let up = Calls::start(|| unavailable_with_pushback("2000")).await;
    let weir = Weir::single(&up.up.url(), GRPC).await;
    let (status, attempts, stop) = call(&weir).await;
    assert_eq!(
        (status.as_str(), attempts.as_str(), stop.as_str()),
        ("0", "2", "")
    );
    let gap = up.gap();
    assert!(
        gap >= Duration::from_secs(2) && gap < Duration::from_millis(2100),
        "the retry came {gap:?} after the first call"
    );
}

/// A wait longer than `max_retry_after` stops, as a `Retry-After` does:
/// the client gets the answer at once and can wait itself.
#[tokio::test(start_paused = true)]
async fn a_grpc_pushback_above_max_retry_after_stops() {
    let up = Calls::start(|| unavailable_with_pushback("120000")).await;
    let weir = Weir::single(&up.up.url(), GRPC).await;
    let start = Instant::now();
    let (status, attempts, stop) = call(&weir).await;
    assert_eq!(
        (status.as_str(), attempts.as_str(), stop.as_str()),
        ("14", "1", "retry_after")
    );
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(up.count(), 1);
}

/// A server that sends its head, then trailers with the status and the
/// pushback before any message: weir holds the answer until then, and
/// reads both there.
#[tokio::test(start_paused = true)]
async fn a_grpc_pushback_in_trailers_before_any_message_is_read() {
    fn head_then_trailers() -> Response<TestBody> {
        type Chunk = Result<hyper::body::Frame<Bytes>, Box<dyn std::error::Error + Send + Sync>>;
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", "14".parse().unwrap());
        t.insert("grpc-retry-pushback-ms", "-1".parse().unwrap());
        let frames: Vec<Chunk> = vec![Ok(hyper::body::Frame::trailers(t))];
        Response::builder()
            .header("content-type", "application/grpc")
            .body(BodyExt::boxed(http_body_util::StreamBody::new(
                futures_util::stream::iter(frames),
            )))
            .unwrap()
    }
    let up = Calls::start(head_then_trailers).await;
    let weir = Weir::single(&up.up.url(), GRPC).await;
    let (status, attempts, stop) = call(&weir).await;
    assert_eq!(
        (status.as_str(), attempts.as_str(), stop.as_str()),
        ("14", "1", "pushback")
    );
    assert_eq!(up.count(), 1);
}

/// Answers `status` with `fields` to every request.
async fn always(status: u16, fields: &'static [(&'static str, &'static str)]) -> TestUpstream {
    TestUpstream::start(move |_r| async move {
        let mut b = Response::builder().status(status);
        for (k, v) in fields {
            b = b.header(*k, *v);
        }
        b.body(body("busy")).unwrap()
    })
    .await
}

async fn get(weir: &Weir) -> (http::response::Parts, String) {
    let req = Request::get(weir.url("/r"))
        .header("host", "svc")
        .body(body(""))
        .unwrap();
    let (parts, b) = read_body(client().request(req).await.unwrap()).await;
    (parts, String::from_utf8_lossy(&b).into_owned())
}

const FAST: &str = "[upstreams.svc.retry]\nretry_on = [\"429\", \"503\"]\n[upstreams.svc.retry.backoff]\nbase = \"10ms\"\njitter = \"none\"\n";

both_paths!(
    #[tokio::test(start_paused = true)]
    an_envoy_overloaded_answer_is_not_retried
);
/// Regression (issue 54): Envoy marks its own refusals `x-envoy-overloaded`
/// and never retries them, so that a chain of proxies does not multiply
/// retries; weir retried them.
async fn an_envoy_overloaded_answer_is_not_retried(path: DataPath) {
    let up = always(503, &[("x-envoy-overloaded", "true")]).await;
    let weir = Weir::single_on(path, &up.url(), FAST).await;
    let (parts, b) = get(&weir).await;
    assert_eq!((parts.status.as_u16(), b.as_str()), (503, "busy"));
    assert_eq!(header(&parts, "x-weir-attempts"), "1");
    assert_eq!(header(&parts, "x-weir-retry-stop"), "pushback");
    // Relayed as it came: the client, or a proxy before weir, reads it too.
    assert_eq!(header(&parts, "x-envoy-overloaded"), "true");
    assert_eq!(up.requests(), 1);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    another_weirs_refusal_is_not_retried
);
/// Regression (issue 54): another weir's `x-weir-error: overloaded`,
/// `circuit_open` or `rate_limited` (an egress weir's, or one an app
/// relayed) was retried. Read before weir strips the `x-weir-*` fields,
/// which it still does.
async fn another_weirs_refusal_is_not_retried(path: DataPath) {
    for (status, code) in [
        (503, "overloaded"),
        (503, "circuit_open"),
        (429, "rate_limited"),
    ] {
        let fields: &'static [(&str, &str)] = match code {
            "overloaded" => &[("x-weir-error", "overloaded")],
            "circuit_open" => &[("x-weir-error", "circuit_open")],
            _ => &[("x-weir-error", "rate_limited")],
        };
        let up = always(status, fields).await;
        let weir = Weir::single_on(path, &up.url(), FAST).await;
        let (parts, _) = get(&weir).await;
        assert_eq!(parts.status.as_u16(), status, "{code}");
        assert_eq!(header(&parts, "x-weir-retry-stop"), "pushback", "{code}");
        assert_eq!(header(&parts, "x-weir-attempts"), "1", "{code}");
        assert_eq!(header(&parts, "x-weir-error"), "", "{code}: not stripped");
        assert_eq!(up.requests(), 1, "{code}");
    }
    // Any other code of weir's is an answer like any other: retried.
    let up = always(503, &[("x-weir-error", "connect_failed")]).await;
    let weir = Weir::single_on(path, &up.url(), FAST).await;
    let (parts, _) = get(&weir).await;
    assert_eq!(header(&parts, "x-weir-attempts"), "3");
    assert_eq!(header(&parts, "x-weir-retry-stop"), "attempts");
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_refusal_still_counts_for_the_breaker
);
/// Pushback stops the retry, not the breaker's count: the answer counts
/// as its status does.
async fn a_refusal_still_counts_for_the_breaker(path: DataPath) {
    let up = always(503, &[("x-envoy-overloaded", "true")]).await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        &format!("[upstreams.svc.breaker]\nconsecutive_failures = 2\nfailing_for = \"0s\"\nopen = \"30s\"\n{FAST}"),
    )
    .await;
    for _ in 0..2 {
        assert_eq!(header(&get(&weir).await.0, "x-weir-retry-stop"), "pushback");
    }
    let (parts, _) = get(&weir).await;
    assert_eq!(parts.status, 503);
    assert_eq!(header(&parts, "x-weir-error"), "circuit_open");
    assert_eq!(up.requests(), 2);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_chain_of_weirs_does_not_multiply_retries
);
/// Two weirs in a row: the inner one's breaker opens on its upstream's
/// 503s and refuses; the outer one, which retries 503s, does not retry
/// that refusal, and the client hears it with Envoy's mark.
async fn a_chain_of_weirs_does_not_multiply_retries(path: DataPath) {
    let up = always(503, &[]).await;
    let inner = Weir::single(
        &up.url(),
        "[upstreams.svc.retry]\nmax_attempts = 1\n[upstreams.svc.breaker]\nconsecutive_failures = 1\nfailing_for = \"0s\"\nopen = \"30s\"\n",
    )
    .await;
    let outer = Weir::single_on(
        path,
        &format!("http://{}", inner.addr),
        &format!("preserve_host = true\n{FAST}"),
    )
    .await;
    let (parts, _) = get(&outer).await;
    // The first attempt reached the app and got its 503 (which opened the
    // inner breaker); the retry was refused by the inner weir, and not
    // retried again.
    assert_eq!(parts.status, 503);
    assert_eq!(header(&parts, "x-weir-attempts"), "2");
    assert_eq!(header(&parts, "x-weir-retry-stop"), "pushback");
    assert_eq!(header(&parts, "x-envoy-overloaded"), "true");
    assert_eq!(header(&parts, "x-weir-error"), "");
    assert_eq!(up.requests(), 1);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    weirs_own_refusals_carry_envoys_marks
);
/// weir's own refusals under load say so the way an Envoy in front reads:
/// `x-envoy-overloaded: true` on `overloaded` and `circuit_open`,
/// `x-envoy-ratelimited: true` on `rate_limited`; other errors carry
/// neither.
async fn weirs_own_refusals_carry_envoys_marks(path: DataPath) {
    // overloaded: one in flight, no queue.
    let busy = Arc::new(AtomicUsize::new(0));
    let b = busy.clone();
    let up = TestUpstream::start(move |_r| {
        b.fetch_add(1, Ordering::SeqCst);
        async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Response::new(body("done"))
        }
    })
    .await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        "[upstreams.svc.concurrency]\nmax_in_flight = 1\nmax_queue = 0\n",
    )
    .await;
    let w = weir.url("/r");
    let first = tokio::spawn(async move {
        let req = Request::get(w)
            .header("host", "svc")
            .body(body(""))
            .unwrap();
        client().request(req).await.unwrap().status()
    });
    while busy.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (parts, _) = get(&weir).await;
    assert_eq!(
        (
            parts.status.as_u16(),
            header(&parts, "x-weir-error").as_str()
        ),
        (503, "overloaded")
    );
    assert_eq!(header(&parts, "x-envoy-overloaded"), "true");
    assert_eq!(first.await.unwrap(), 200);

    // rate_limited (an upstream that answers at once: no token comes back
    // meanwhile).
    let up = TestUpstream::text("ok").await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        "[upstreams.svc.rate_limit]\nrps = 1.0\nburst = 1\n",
    )
    .await;
    get(&weir).await;
    let (parts, _) = get(&weir).await;
    assert_eq!(header(&parts, "x-weir-error"), "rate_limited");
    assert_eq!(header(&parts, "x-envoy-ratelimited"), "true");
    assert_eq!(header(&parts, "x-envoy-overloaded"), "");

    // circuit_open, and an error that is not a refusal (connect_failed).
    let dead = refused_addr().await;
    let weir = Weir::single_on(
        path,
        &format!("http://{dead}"),
        "[upstreams.svc.retry]\nmax_attempts = 1\n[upstreams.svc.breaker]\nconsecutive_failures = 1\nfailing_for = \"0s\"\nopen = \"30s\"\n",
    )
    .await;
    let (parts, _) = get(&weir).await;
    assert_eq!(header(&parts, "x-weir-error"), "connect_failed");
    assert_eq!(header(&parts, "x-envoy-overloaded"), "");
    let (parts, _) = get(&weir).await;
    assert_eq!(header(&parts, "x-weir-error"), "circuit_open");
    assert_eq!(header(&parts, "x-envoy-overloaded"), "true");
}

/// weir's gRPC-shaped refusals carry the mark too.
#[tokio::test(start_paused = true)]
async fn weirs_own_grpc_refusals_carry_envoys_mark() {
    let dead = refused_addr().await;
    let weir = Weir::single(
        &format!("http://{dead}"),
        "protocol = \"grpc\"\n[upstreams.svc.retry]\nmax_attempts = 1\n[upstreams.svc.breaker]\nconsecutive_failures = 1\nfailing_for = \"0s\"\nopen = \"30s\"\n",
    )
    .await;
    let resp = h2_request(weir.addr, grpc_call()).await;
    assert_eq!(resp.headers()["x-weir-error"], "connect_failed");
    assert!(resp.headers().get("x-envoy-overloaded").is_none());
    let resp = h2_request(weir.addr, grpc_call()).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["grpc-status"], "14");
    assert_eq!(resp.headers()["x-weir-error"], "circuit_open");
    assert_eq!(resp.headers()["x-envoy-overloaded"], "true");
}
