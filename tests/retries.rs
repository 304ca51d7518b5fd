//! Retries on live traffic against upstreams that misbehave on purpose: what
//! is retried, what never is, and what the upstream actually received.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use hyper::{Request, Response, StatusCode};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Answers `first` for the first `n` requests, then 200 "ok".
async fn fails_first(
    n: usize,
    first: u16,
    extra: &'static [(&'static str, &'static str)],
) -> TestUpstream {
    let count = Arc::new(AtomicUsize::new(0));
    TestUpstream::start(move |_r| {
        let i = count.fetch_add(1, Ordering::SeqCst);
        async move {
            if i < n {
                let mut b = Response::builder().status(first);
                for (k, v) in extra {
                    b = b.header(*k, *v);
                }
                b.body(body("failed")).unwrap()
            } else {
                Response::new(body("ok"))
            }
        }
    })
    .await
}

async fn send(
    weir: &Weir,
    method: &str,
    headers: &[(&str, &str)],
    payload: &str,
) -> (http::response::Parts, String) {
    let mut b = Request::builder()
        .method(method)
        .uri(weir.url("/r"))
        .header("host", "svc");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let (parts, body) = read_body(
        client()
            .request(b.body(body(payload.to_string())).unwrap())
            .await
            .unwrap(),
    )
    .await;
    (parts, String::from_utf8_lossy(&body).into_owned())
}

const FAST: &str = "[upstreams.svc.retry.backoff]\nbase = \"10ms\"\njitter = \"none\"\n";

both_paths!(
    #[tokio::test(start_paused = true)]
    get_after_503_is_retried
);
async fn get_after_503_is_retried(path: DataPath) {
    let up = fails_first(1, 503, &[]).await;
    let weir = Weir::single_on(path, &up.url(), FAST).await;
    let (parts, b) = send(&weir, "GET", &[], "").await;
    assert_eq!((parts.status, b.as_str()), (StatusCode::OK, "ok"));
    assert_eq!(header(&parts, "x-weir-attempts"), "2");
    assert_eq!(header(&parts, "x-weir-retry-stop"), "");
    assert_eq!(up.requests(), 2);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    get_after_a_connection_reset_is_retried
);
async fn get_after_a_connection_reset_is_retried(path: DataPath) {
    let up = RawUpstream::start(|n, mut s| async move {
        read_head(&mut s).await;
        if n == 0 {
            reset(s);
        } else {
            respond(&mut s, 200, "", "ok").await;
        }
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), FAST).await;
    let (parts, b) = send(&weir, "GET", &[], "").await;
    assert_eq!((parts.status, b.as_str()), (StatusCode::OK, "ok"));
    assert_eq!(header(&parts, "x-weir-attempts"), "2");
    assert_eq!(up.connections(), 2);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    post_after_connection_refused_is_retried
);
async fn post_after_connection_refused_is_retried(path: DataPath) {
    // Bound but not listening: connections are refused until `listen`.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = sock.local_addr().unwrap();
    let weir = Weir::single_on(
        path,
        &format!("http://{addr}"),
        "[upstreams.svc.retry.backoff]\nbase = \"1s\"\njitter = \"none\"\n",
    )
    .await;
    let w = weir.url("/r");
    let call = tokio::spawn(async move {
        let req = Request::post(w)
            .header("host", "svc")
            .body(body("payload"))
            .unwrap();
        read_body(client().request(req).await.unwrap()).await
    });
    // The first attempt is refused; weir backs off for 1 s; start listening.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listener = sock.listen(16).unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let s2 = seen.clone();
    let _up = RawUpstream::on(listener, move |_n, mut s| {
        let seen = s2.clone();
        async move {
            read_head(&mut s).await;
            seen.fetch_add(1, Ordering::SeqCst);
            respond(&mut s, 200, "", "created").await;
        }
    });
    let (parts, b) = call.await.unwrap();
    assert_eq!((parts.status, &b[..]), (StatusCode::OK, &b"created"[..]));
    assert_eq!(header(&parts, "x-weir-attempts"), "2");
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "the POST was delivered once"
    );
}

both_paths!(
    #[tokio::test(start_paused = true)]
    connect_failures_are_retried_up_to_max_attempts
);
async fn connect_failures_are_retried_up_to_max_attempts(path: DataPath) {
    let dead = refused_addr().await;
    let weir = Weir::single_on(path, &format!("http://{dead}"), FAST).await;
    let (parts, b) = send(&weir, "POST", &[], "x").await;
    assert_eq!(parts.status, 502);
    assert_eq!(header(&parts, "x-weir-error"), "connect_failed");
    assert_eq!(header(&parts, "x-weir-attempts"), "3");
    assert_eq!(header(&parts, "x-weir-retry-stop"), "attempts");
    assert!(b.contains("connect_failed"));
}

/// Sleeps 5 s on the first request, answers at once after that.
async fn slow_first() -> TestUpstream {
    let count = Arc::new(AtomicUsize::new(0));
    TestUpstream::start(move |_r| {
        let i = count.fetch_add(1, Ordering::SeqCst);
        async move {
            if i == 0 {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            Response::new(body(format!("answer {i}")))
        }
    })
    .await
}

both_paths!(
    #[tokio::test(start_paused = true)]
    post_with_idempotency_key_after_a_timeout_is_retried
);
async fn post_with_idempotency_key_after_a_timeout_is_retried(path: DataPath) {
    let up = slow_first().await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        &format!("per_try_timeout = \"1s\"\n{FAST}"),
    )
    .await;
    let (parts, b) = send(&weir, "POST", &[("idempotency-key", "k-1")], "charge").await;
    assert_eq!((parts.status, b.as_str()), (StatusCode::OK, "answer 1"));
    assert_eq!(header(&parts, "x-weir-attempts"), "2");
    assert_eq!(up.requests(), 2);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    post_after_a_timeout_is_never_retried
);
async fn post_after_a_timeout_is_never_retried(path: DataPath) {
    let up = slow_first().await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        &format!("per_try_timeout = \"1s\"\n{FAST}"),
    )
    .await;
    let (parts, b) = send(&weir, "POST", &[], "charge").await;
    assert_eq!(parts.status, 504);
    assert_eq!(header(&parts, "x-weir-error"), "upstream_timeout");
    assert_eq!(header(&parts, "x-weir-retry-stop"), "unsafe");
    assert_eq!(header(&parts, "x-weir-attempts"), "1");
    assert!(b.contains("upstream_timeout"));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        up.requests(),
        1,
        "the upstream processed the POST; it must see it once"
    );
}

both_paths!(
    #[tokio::test(start_paused = true)]
    post_after_a_reset_mid_request_is_never_retried
);
async fn post_after_a_reset_mid_request_is_never_retried(path: DataPath) {
    let up = RawUpstream::start(|_n, mut s| async move {
        read_head(&mut s).await;
        reset(s);
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), FAST).await;
    let (parts, _) = send(&weir, "POST", &[], "charge").await;
    assert_eq!(parts.status, 502);
    assert_eq!(header(&parts, "x-weir-error"), "upstream_reset");
    assert_eq!(header(&parts, "x-weir-retry-stop"), "unsafe");
    assert_eq!(up.connections(), 1);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_400_is_returned_as_it_is
);
async fn a_400_is_returned_as_it_is(path: DataPath) {
    let up = fails_first(5, 400, &[("x-upstream", "said no")]).await;
    let weir = Weir::single_on(path, &up.url(), FAST).await;
    let (parts, b) = send(&weir, "GET", &[], "").await;
    assert_eq!((parts.status.as_u16(), b.as_str()), (400, "failed"));
    assert_eq!(header(&parts, "x-upstream"), "said no");
    assert_eq!(header(&parts, "x-weir-retry-stop"), "");
    assert_eq!(up.requests(), 1);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_body_over_the_replay_limit_is_not_replayed
);
async fn a_body_over_the_replay_limit_is_not_replayed(path: DataPath) {
    let up = fails_first(5, 503, &[]).await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        &format!("[upstreams.svc.retry]\nmax_replay_body_bytes = 1024\n{FAST}"),
    )
    .await;
    let big = "x".repeat(100 * 1024);
    let (parts, b) = send(&weir, "PUT", &[], &big).await;
    assert_eq!((parts.status.as_u16(), b.as_str()), (503, "failed"));
    assert_eq!(header(&parts, "x-weir-retry-stop"), "body");
    assert_eq!(up.requests(), 1);
    // A small body on the same upstream is replayed.
    let (parts, _) = send(&weir, "PUT", &[], "small").await;
    assert_eq!(header(&parts, "x-weir-attempts"), "3");
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_long_retry_after_is_passed_back_not_waited_for
);
async fn a_long_retry_after_is_passed_back_not_waited_for(path: DataPath) {
    let up = fails_first(5, 503, &[("retry-after", "120")]).await;
    let weir = Weir::single_on(path, &up.url(), FAST).await;
    let start = Instant::now();
    let (parts, _) = send(&weir, "GET", &[], "").await;
    assert_eq!(parts.status, 503);
    assert_eq!(header(&parts, "retry-after"), "120");
    assert_eq!(header(&parts, "x-weir-retry-stop"), "retry_after");
    assert_eq!(up.requests(), 1);
    assert!(start.elapsed() < Duration::from_secs(1));
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_429_with_retry_after_waits_that_long_when_listed
);
async fn a_429_with_retry_after_waits_that_long_when_listed(path: DataPath) {
    let up = fails_first(1, 429, &[("retry-after", "2")]).await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        &format!("[upstreams.svc.retry]\nretry_on = [\"429\", \"503\"]\n{FAST}"),
    )
    .await;
    let start = Instant::now();
    let (parts, b) = send(&weir, "POST", &[], "x").await;
    assert_eq!((parts.status, b.as_str()), (StatusCode::OK, "ok"));
    let e = start.elapsed();
    assert!(
        e >= Duration::from_secs(2) && e < Duration::from_millis(2100),
        "{e:?}"
    );
    assert_eq!(up.requests(), 2);

    // Not listed: the 429 goes back as it came.
    let up = fails_first(1, 429, &[("retry-after", "2")]).await;
    let weir = Weir::single_on(path, &up.url(), FAST).await;
    let (parts, _) = send(&weir, "GET", &[], "").await;
    assert_eq!(parts.status, 429);
    assert_eq!(header(&parts, "x-weir-retry-stop"), "");
    assert_eq!(up.requests(), 1);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_client_that_leaves_during_backoff_cancels_the_retry
);
async fn a_client_that_leaves_during_backoff_cancels_the_retry(path: DataPath) {
    let up = fails_first(100, 503, &[]).await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        "[upstreams.svc.retry.backoff]\nbase = \"2s\"\nmax = \"2s\"\njitter = \"none\"\n",
    )
    .await;
    let w = weir.url("/r");
    let call = tokio::spawn(async move {
        let req = Request::get(w)
            .header("host", "svc")
            .body(body(""))
            .unwrap();
        client().request(req).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(up.requests(), 1);
    call.abort(); // the client goes away during the 2 s backoff
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        up.requests(),
        1,
        "a retry was made for a client that had left"
    );
}

both_paths!(
    #[tokio::test(start_paused = true)]
    the_deadline_is_never_crossed
);
async fn the_deadline_is_never_crossed(path: DataPath) {
    let up = TestUpstream::start(|_r| async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        Response::builder().status(503).body(body("busy")).unwrap()
    })
    .await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        "timeout = \"1s\"\n[upstreams.svc.retry]\nmax_attempts = 5\n[upstreams.svc.retry.backoff]\nbase = \"100ms\"\njitter = \"none\"\n",
    )
    .await;
    let start = Instant::now();
    let (parts, b) = send(&weir, "GET", &[], "").await;
    let e = start.elapsed();
    assert_eq!((parts.status.as_u16(), b.as_str()), (503, "busy"));
    assert_eq!(header(&parts, "x-weir-retry-stop"), "deadline");
    assert_eq!(header(&parts, "x-weir-attempts"), "2");
    assert!(e < Duration::from_secs(1), "{e:?}");
}

both_paths!(
    #[tokio::test(start_paused = true)]
    the_budget_bounds_retries_against_an_always_failing_upstream
);
async fn the_budget_bounds_retries_against_an_always_failing_upstream(path: DataPath) {
    let up = fails_first(usize::MAX, 503, &[]).await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        "[upstreams.svc.breaker]\nenabled = false\n[upstreams.svc.retry.backoff]\nbase = \"1ms\"\nmax = \"2ms\"\njitter = \"none\"\n",
    )
    .await;
    let c = client();
    let mut budget_stops = 0;
    let start = Instant::now();
    for _ in 0..200 {
        let req = Request::get(weir.url("/r"))
            .header("host", "svc")
            .body(body(""))
            .unwrap();
        let (parts, _) = read_body(c.request(req).await.unwrap()).await;
        assert_eq!(parts.status, 503);
        if header(&parts, "x-weir-retry-stop") == "budget" {
            budget_stops += 1;
        }
    }
    // The bound holds within one ttl (10 s); the run must fit in it.
    assert!(start.elapsed() < Duration::from_secs(10));
    let attempts = up.requests();
    assert!(
        attempts as f64 <= 200.0 * 1.1 + 10.0 * 10.0,
        "{attempts} attempts for 200 requests"
    );
    assert!(budget_stops > 0, "x-weir-retry-stop: budget never seen");
    assert!(attempts > 200, "no retries at all");
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_lowered_deadline_is_not_blamed_on_the_upstream
);
/// Regression: a client that lowers its own deadline must not be able to open
/// the breaker for everyone else (review finding on the first attempt loop).
async fn a_lowered_deadline_is_not_blamed_on_the_upstream(path: DataPath) {
    let up = TestUpstream::start(|_r| async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Response::new(body("slow but fine"))
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), "[upstreams.svc.retry]\nmax_attempts = 1\n").await;
    for _ in 0..10 {
        let (parts, _) = send(&weir, "GET", &[("x-weir-timeout-ms", "50")], "").await;
        assert_eq!(header(&parts, "x-weir-error"), "deadline_exceeded");
    }
    // Nothing left at all: answered without contacting the upstream.
    let before = up.requests();
    let (parts, _) = send(&weir, "GET", &[("x-weir-timeout-ms", "0")], "").await;
    assert_eq!(header(&parts, "x-weir-error"), "deadline_exceeded");
    assert_eq!(up.requests(), before);
    // The breaker is still closed.
    let (parts, b) = send(&weir, "GET", &[], "").await;
    assert_eq!((parts.status.as_u16(), b.as_str()), (200, "slow but fine"));
}

both_paths!(
    #[tokio::test(start_paused = true)]
    with_retries_off_the_stop_reason_is_attempts
);
async fn with_retries_off_the_stop_reason_is_attempts(path: DataPath) {
    let up = fails_first(5, 503, &[]).await;
    let weir = Weir::single_on(path, &up.url(), "[upstreams.svc.retry]\nmax_attempts = 1\n").await;
    let (parts, _) = send(&weir, "GET", &[], "").await;
    assert_eq!(parts.status, 503);
    assert_eq!(header(&parts, "x-weir-retry-stop"), "attempts");
    assert_eq!(header(&parts, "x-weir-attempts"), "1");
}

both_paths!(
    #[tokio::test(start_paused = true)]
    an_idempotency_key_named_in_connection_does_not_make_a_post_safe
);
/// Regression: the idempotency key only counts if the upstream receives it.
async fn an_idempotency_key_named_in_connection_does_not_make_a_post_safe(path: DataPath) {
    let up = slow_first().await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        &format!("per_try_timeout = \"1s\"\n{FAST}"),
    )
    .await;
    let (parts, _) = send(
        &weir,
        "POST",
        &[("idempotency-key", "k"), ("connection", "idempotency-key")],
        "x",
    )
    .await;
    assert_eq!(parts.status, 504);
    assert_eq!(header(&parts, "x-weir-retry-stop"), "unsafe");
    assert_eq!(up.requests(), 1);
}
