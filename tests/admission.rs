//! The circuit breaker, rate limits and the concurrency gate on live traffic.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use hyper::{Request, Response};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const HEALTHY: u8 = 0;
const FAILING: u8 = 1;
const SLOW_OK: u8 = 2;
const SLOW_FAIL: u8 = 3;

/// An upstream whose behaviour the test switches.
async fn switchable() -> (TestUpstream, Arc<AtomicU8>) {
    let mode = Arc::new(AtomicU8::new(FAILING));
    let m = mode.clone();
    let up = TestUpstream::start(move |_r| {
        let mode = m.load(Ordering::SeqCst);
        async move {
            if mode >= SLOW_OK {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            match mode {
                FAILING | SLOW_FAIL => Response::builder().status(503).body(body("down")).unwrap(),
                _ => Response::new(body("up")),
            }
        }
    })
    .await;
    (up, mode)
}

async fn call(weir: &Weir, headers: &[(&str, &str)]) -> (u16, String, http::response::Parts) {
    let mut b = Request::get(weir.url("/")).header("host", "svc");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let (parts, _) = read_body(client().request(b.body(body("")).unwrap()).await.unwrap()).await;
    (parts.status.as_u16(), header(&parts, "x-weir-error"), parts)
}

both_paths!(
    #[tokio::test(start_paused = true)]
    breaker_opens_probes_once_closes_and_reopens_for_twice_as_long
);
async fn breaker_opens_probes_once_closes_and_reopens_for_twice_as_long(path: DataPath) {
    let (up, mode) = switchable().await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        "[upstreams.svc.retry]\nmax_attempts = 1\n[upstreams.svc.breaker]\nconsecutive_failures = 5\nfailing_for = \"0s\"\nopen = \"10s\"\nmax_open = \"5m\"\nopen_jitter = 0.0\n",
    )
    .await;
    // Five consecutive failures open it.
    for _ in 0..5 {
        assert_eq!(call(&weir, &[]).await.0, 503);
    }
    assert_eq!(up.requests(), 5);
    let (status, code, parts) = call(&weir, &[]).await;
    assert_eq!((status, code.as_str()), (503, "circuit_open"));
    assert_eq!(header(&parts, "retry-after"), "10");
    assert_eq!(up.requests(), 5, "an open breaker let a request through");

    // After the open interval: exactly one probe while 50 others are refused.
    tokio::time::sleep(Duration::from_secs(10)).await;
    mode.store(SLOW_OK, Ordering::SeqCst);
    let w = weir.url("/");
    let probe = tokio::spawn(async move {
        let req = Request::get(w)
            .header("host", "svc")
            .body(body(""))
            .unwrap();
        client().request(req).await.unwrap().status().as_u16()
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut refused = Vec::new();
    for _ in 0..50 {
        let w = weir.url("/");
        refused.push(tokio::spawn(async move {
            let req = Request::get(w)
                .header("host", "svc")
                .body(body(""))
                .unwrap();
            let resp = client().request(req).await.unwrap();
            json_error(resp).await
        }));
    }
    for r in refused {
        let (status, code, _) = r.await.unwrap();
        assert_eq!((status, code.as_str()), (503, "circuit_open"));
    }
    assert_eq!(up.requests(), 6, "more than one probe reached the upstream");
    assert_eq!(probe.await.unwrap(), 200);

    // A good probe closed it.
    mode.store(HEALTHY, Ordering::SeqCst);
    assert_eq!(call(&weir, &[]).await.0, 200);

    // Open it again (the interval was reset by closing: 10 s), then a bad probe doubles it.
    mode.store(FAILING, Ordering::SeqCst);
    for _ in 0..5 {
        call(&weir, &[]).await;
    }
    let (_, code, parts) = call(&weir, &[]).await;
    assert_eq!(code, "circuit_open");
    assert_eq!(header(&parts, "retry-after"), "10");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let before = up.requests();
    assert_eq!(call(&weir, &[]).await.0, 503); // the failing probe
    assert_eq!(up.requests(), before + 1);
    let (_, code, parts) = call(&weir, &[]).await;
    assert_eq!(code, "circuit_open");
    assert_eq!(header(&parts, "retry-after"), "20");
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        call(&weir, &[]).await.1,
        "circuit_open",
        "re-opened for less than twice as long"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    mode.store(HEALTHY, Ordering::SeqCst);
    assert_eq!(call(&weir, &[]).await.0, 200);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    rate_limit_rejects_with_retry_after_or_waits
);
async fn rate_limit_rejects_with_retry_after_or_waits(path: DataPath) {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        "[upstreams.svc.rate_limit]\nrps = 10.0\nburst = 5\n",
    )
    .await;
    for _ in 0..5 {
        assert_eq!(call(&weir, &[]).await.0, 200);
    }
    let (status, code, parts) = call(&weir, &[]).await;
    assert_eq!((status, code.as_str()), (429, "rate_limited"));
    assert_eq!(header(&parts, "retry-after"), "1");
    assert_eq!(up.requests(), 5);

    let weir = Weir::single_on(
        path,
        &up.url(),
        "[upstreams.svc.rate_limit]\nrps = 10.0\nburst = 5\nmax_wait = \"1s\"\n",
    )
    .await;
    let start = tokio::time::Instant::now();
    for _ in 0..6 {
        assert_eq!(call(&weir, &[]).await.0, 200);
    }
    let e = start.elapsed();
    assert!(
        e >= Duration::from_millis(90) && e < Duration::from_millis(200),
        "{e:?}"
    );
}

both_paths!(
    #[tokio::test(start_paused = true)]
    keyed_limits_keep_tenants_apart_and_the_registry_bounded
);
async fn keyed_limits_keep_tenants_apart_and_the_registry_bounded(path: DataPath) {
    let up = TestUpstream::text("ok").await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        "[upstreams.svc.rate_limit]\nrps = 1.0\nburst = 2\nkey = \"header:x-tenant\"\nmax_keys = 1000\n",
    )
    .await;
    assert_eq!(call(&weir, &[("x-tenant", "a")]).await.0, 200);
    assert_eq!(call(&weir, &[("x-tenant", "a")]).await.0, 200);
    assert_eq!(call(&weir, &[("x-tenant", "a")]).await.0, 429);
    assert_eq!(call(&weir, &[("x-tenant", "b")]).await.0, 200);
    assert_eq!(call(&weir, &[("x-tenant", "b")]).await.0, 200);

    let c = client();
    for i in 0..20_000 {
        let req = Request::get(weir.url("/"))
            .header("host", "svc")
            .header("x-tenant", format!("t{i}"))
            .body(body(""))
            .unwrap();
        let resp = c.request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        drop(read_body(resp).await);
    }
    let snap = weir.handle.as_ref().unwrap().snapshot();
    let stats = snap.upstreams[0]
        .state
        .live()
        .limiter
        .as_ref()
        .unwrap()
        .stats();
    assert_eq!(stats.size, 1000);
    assert!(stats.evictions >= 19_000, "{stats:?}");
}

both_paths!(
    #[tokio::test(start_paused = true)]
    concurrency_limit_queues_then_refuses
);
async fn concurrency_limit_queues_then_refuses(path: DataPath) {
    let active = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (a, p) = (active.clone(), peak.clone());
    let up = TestUpstream::start(move |_r| {
        let (a, p) = (a.clone(), p.clone());
        async move {
            let now = a.fetch_add(1, Ordering::SeqCst) + 1;
            p.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(1)).await;
            a.fetch_sub(1, Ordering::SeqCst);
            Response::new(body("done"))
        }
    })
    .await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        "[upstreams.svc.concurrency]\nmax_in_flight = 4\nmax_queue = 2\n",
    )
    .await;
    let mut calls = Vec::new();
    for _ in 0..10 {
        let w = weir.url("/");
        calls.push(tokio::spawn(async move {
            let req = Request::get(w)
                .header("host", "svc")
                .body(body(""))
                .unwrap();
            json_error(client().request(req).await.unwrap()).await
        }));
    }
    let mut served = 0;
    let mut overloaded = 0;
    for c in calls {
        match c.await.unwrap() {
            (200, _, _) => served += 1,
            (503, code, _) if code == "overloaded" => overloaded += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((served, overloaded), (6, 4));
    assert_eq!(peak.load(Ordering::SeqCst), 4);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    requests_refused_by_the_breaker_or_the_gate_keep_their_rate_tokens
);
/// During an outage the app hears `circuit_open`, not `rate_limited`: a
/// request weir refuses itself gives back its token (docs/reference/admission.md#admission).
async fn requests_refused_by_the_breaker_or_the_gate_keep_their_rate_tokens(path: DataPath) {
    let (up, _mode) = switchable().await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        "[upstreams.svc.retry]\nmax_attempts = 1\n[upstreams.svc.breaker]\nconsecutive_failures = 5\nfailing_for = \"0s\"\nopen = \"30s\"\nmax_open = \"30s\"\nopen_jitter = 0.0\n[upstreams.svc.rate_limit]\nrps = 5\nburst = 5\n",
    )
    .await;
    for _ in 0..5 {
        assert_eq!(call(&weir, &[]).await.0, 503);
    }
    // The five that reached the upstream spent their tokens (and opened
    // the breaker); a second refills them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut codes = std::collections::BTreeMap::new();
    for _ in 0..100 {
        let (status, code, _) = call(&weir, &[]).await;
        *codes.entry((status, code)).or_insert(0) += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        codes,
        [((503, "circuit_open".to_string()), 100)]
            .into_iter()
            .collect(),
        "100 requests in one second with the breaker open"
    );
    assert_eq!(up.requests(), 5);
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_request_over_the_adaptive_limit_is_refused_overloaded_at_once
);
/// `limit = "adaptive"` (docs/reference/admission.md#adaptive-limit): with
/// the limit's places all held, the next request is refused at once with
/// 503 `overloaded` — never queued, whatever `max_queue` says — and the
/// upstream never sees it.
async fn a_request_over_the_adaptive_limit_is_refused_overloaded_at_once(path: DataPath) {
    let up = TestUpstream::start(|_r| async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Response::new(body("done"))
    })
    .await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        "[upstreams.svc.concurrency]\nlimit = \"adaptive\"\nmin_limit = 1\ninitial_limit = 2\nmax_in_flight = 100\nmax_queue = 50\n",
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let w = weir.url("/");
        held.push(tokio::spawn(async move {
            let req = Request::get(w)
                .header("host", "svc")
                .body(body(""))
                .unwrap();
            client().request(req).await.unwrap().status().as_u16()
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(up.requests(), 2);
    let start = tokio::time::Instant::now();
    let (status, code, _) = call(&weir, &[]).await;
    assert_eq!((status, code.as_str()), (503, "overloaded"));
    assert!(start.elapsed() < Duration::from_millis(100), "it waited");
    assert_eq!(up.requests(), 2, "the refused request reached the upstream");
    for h in held {
        assert_eq!(h.await.unwrap(), 200);
    }
    // Places free again: let in.
    assert_eq!(call(&weir, &[]).await.0, 200);
}

both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    slow_readers_and_slow_uploaders_hold_no_adaptive_place
);
/// The adaptive limit judges the upstream, not the client
/// (docs/reference/admission.md#adaptive-limit): 6 clients that never read
/// their 8 MB answer and 6 that send their body a byte at a time, against
/// a limit of 3, leave a well-behaved client every request. (On 6790b03
/// the readers' slots counted until their bodies were read, and every
/// request of the good client was refused `overloaded`.)
async fn slow_readers_and_slow_uploaders_hold_no_adaptive_place(path: DataPath) {
    use tokio::io::AsyncWriteExt;
    let big = bytes::Bytes::from(vec![b'x'; 8 << 20]);
    let up = TestUpstream::start(move |r: Request<hyper::body::Incoming>| {
        let big = big.clone();
        async move {
            if r.uri().path() == "/big" {
                Response::new(body(big))
            } else {
                Response::new(body("ok"))
            }
        }
    })
    .await;
    let weir = Weir::single_on(
        path,
        &up.url(),
        "[upstreams.svc.concurrency]\nlimit = \"adaptive\"\nmin_limit = 3\ninitial_limit = 3\nmax_in_flight = 100\n",
    )
    .await;
    // Readers: the head is read, the body never.
    let mut readers = Vec::new();
    for _ in 0..6 {
        let req = Request::get(weir.url("/big"))
            .header("host", "svc")
            .body(body(""))
            .unwrap();
        let resp = client().request(req).await.unwrap();
        if resp.status() != 200 {
            let (p, b) = read_body(resp).await;
            panic!("{p:?} {b:?}");
        }
        readers.push(resp);
    }
    // Uploaders: a head promising 4 bytes, then one byte, then silence.
    let mut uploaders = Vec::new();
    for _ in 0..6 {
        let mut s = tokio::net::TcpStream::connect(weir.addr).await.unwrap();
        s.write_all(b"POST /up HTTP/1.1\r\nhost: svc\r\ncontent-length: 4\r\n\r\na")
            .await
            .unwrap();
        uploaders.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut ok = 0;
    for _ in 0..30 {
        if call(&weir, &[]).await.0 == 200 {
            ok += 1;
        }
    }
    assert_eq!(ok, 30, "the good client's requests");
    drop(readers);
    drop(uploaders);
}

/// Client-side throttling on, one attempt a request, the breaker out of the
/// way (it would open on the 503s first).
const THROTTLED: &str = "[upstreams.svc.retry]\nmax_attempts = 1\n[upstreams.svc.breaker]\nenabled = false\n[upstreams.svc.throttle]\nenabled = true\n";

/// Sends `n` requests one after the other, 10 ms apart: `(answered by the
/// upstream, refused by weir with overloaded)`.
async fn offer(weir: &Weir, n: usize) -> (usize, usize) {
    let (mut upstream, mut refused) = (0, 0);
    for _ in 0..n {
        let (status, code, _) = call(weir, &[]).await;
        match code.as_str() {
            "overloaded" => {
                assert_eq!(status, 503);
                refused += 1;
            }
            "" => upstream += 1,
            other => panic!("weir answered {status} {other}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (upstream, refused)
}

both_paths!(
    #[tokio::test(start_paused = true)]
    an_upstream_that_sheds_is_sent_a_fraction_and_its_recovery_is_seen
);
/// `[throttle]` (docs/reference/admission.md#client-side-throttling): an
/// upstream answering every request 503 gets the first `min_requests`
/// (20), then about 1 − `max_reject` (a tenth) of the rest; the others are
/// refused at once with 503 `overloaded` and never reach it. Once it
/// accepts again, what gets through is accepted and a window later nothing
/// is refused.
async fn an_upstream_that_sheds_is_sent_a_fraction_and_its_recovery_is_seen(path: DataPath) {
    let (up, mode) = switchable().await;
    let weir = Weir::single_on(path, &up.url(), THROTTLED).await;
    let (answered, refused) = offer(&weir, 200).await;
    assert_eq!(answered + refused, 200);
    assert_eq!(
        up.requests(),
        answered,
        "a refused request reached the upstream"
    );
    // 20, then a binomial(180, 0.1) share (mean 18, sd 4).
    assert!(
        (25..=70).contains(&answered),
        "{answered} of 200 reached a shedding upstream"
    );
    let snap = weir.handle.as_ref().unwrap().snapshot();
    let view = snap.upstreams[0].state.throttle.view().unwrap();
    assert_eq!(view.refusals, refused as u64);
    assert_eq!(view.probability, 0.9);
    // It recovers: the requests that go on are accepted, and some do go on.
    mode.store(HEALTHY, Ordering::SeqCst);
    let before = up.requests();
    let (answered, _) = offer(&weir, 100).await;
    assert!(answered >= 1, "nothing reached the recovered upstream");
    assert_eq!(up.requests() - before, answered);
    // A window (30 s) after the shedding, nothing is refused.
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(offer(&weir, 50).await, (50, 0));
    // The series exist while it is on (brought up to date on a scrape).
    snap.upstreams[0].refresh_gauges();
    let text = weir.handle.as_ref().unwrap().metrics().render();
    assert!(
        text.contains("weir_throttle_refusals_total{upstream=\"svc\"}"),
        "{text}"
    );
}

both_paths!(
    #[tokio::test(start_paused = true)]
    a_healthy_upstream_is_never_throttled_and_off_shows_no_series
);
/// With the upstream accepting everything nothing is refused; with it off
/// (the default) a shedding upstream gets every request and `/metrics`
/// carries no throttling series.
async fn a_healthy_upstream_is_never_throttled_and_off_shows_no_series(path: DataPath) {
    let (up, mode) = switchable().await;
    mode.store(HEALTHY, Ordering::SeqCst);
    let weir = Weir::single_on(path, &up.url(), THROTTLED).await;
    assert_eq!(offer(&weir, 300).await, (300, 0));
    let (up, _mode) = switchable().await;
    let off = "[upstreams.svc.retry]\nmax_attempts = 1\n[upstreams.svc.breaker]\nenabled = false\n";
    let weir = Weir::single_on(path, &up.url(), off).await;
    assert_eq!(offer(&weir, 100).await, (100, 0));
    assert_eq!(up.requests(), 100);
    weir.handle.as_ref().unwrap().snapshot().upstreams[0]
        .state
        .refresh_gauges();
    let text = weir.handle.as_ref().unwrap().metrics().render();
    assert!(!text.contains("weir_throttle_"), "{text}");
}

both_paths!(
    #[tokio::test(start_paused = true)]
    one_callers_quota_throttles_that_caller_only
);
/// Client-side throttling (docs/reference/admission.md#client-side-throttling):
/// an upstream answering 429 to one API key (that caller's quota) throttles
/// that caller, locally, and never raises the probability everyone else is
/// refused with. (On 6790b03 the 429s raised the shared probability, and a
/// well-behaved caller's requests were refused `overloaded`.)
async fn one_callers_quota_throttles_that_caller_only(path: DataPath) {
    let up = TestUpstream::start(|r: Request<hyper::body::Incoming>| async move {
        let greedy = r.headers().get("x-api-key").is_some_and(|v| v == "greedy");
        let status = if greedy { 429 } else { 200 };
        Response::builder()
            .status(status)
            .body(body("answer"))
            .unwrap()
    })
    .await;
    let weir = Weir::single_on(path, &up.url(), THROTTLED).await;
    let (mut greedy_local, mut good_ok) = (0, 0);
    for _ in 0..200 {
        let (status, code, _) = call(&weir, &[("x-api-key", "greedy")]).await;
        assert_eq!(status, 429);
        if code == "rate_limited" {
            greedy_local += 1;
        }
        if call(&weir, &[("x-api-key", "polite")]).await.0 == 200 {
            good_ok += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(good_ok, 200, "the polite caller's requests");
    // The greedy caller was throttled on its own account: most of its
    // requests never reached the upstream.
    assert!(greedy_local > 100, "{greedy_local} refused locally");
    let snap = weir.handle.as_ref().unwrap().snapshot();
    let view = snap.upstreams[0].state.throttle.view().unwrap();
    assert_eq!(view.probability, 0.0, "{view:?}");
}
